"""The Tidemark page in Airflow's UI: per configured pipeline, the combined
watermark, every source partition's clock (watermark, lag, idle and catching-up
flags, pending late records), the quarantine backlog, the recent late merges
and a chart of the watermark against processing time.

A FastAPI app that Airflow's api-server mounts at ``/tidemark`` (see
``tidemark_plugin.py``); the UI shows it in an iframe from its navigation. The
page is plain HTML with an inline SVG chart: no JavaScript (Airflow sandboxes
plugin iframes without scripts) and nothing fetched from elsewhere.
``GET /tidemark/api/pipelines`` returns the same data as JSON.

Only users whom Airflow lets see its UI get the data, authenticated exactly as
the REST API authenticates them: a bearer token from ``POST /auth/token``, else
the ``_token`` cookie the UI sets at login. A browser without a valid login is
sent to Airflow's login page; any other caller gets 401 or 403.

Pipelines are the files of ``$TIDEMARK_PIPELINES`` (as the DAGs see them); the
lakehouse is ``$LAKEHOUSE_DIR``. Times are shown in UTC.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from spark_jobs.config import ConfigError, PipelineConfig, load_pipeline
from tidemark_airflow import lakehouse
from tidemark_airflow.lakehouse import MAX_WATERMARK, MIN_WATERMARK, is_finite

URL_PREFIX = "/tidemark"
HISTORY_POINTS = 500
MERGES_SHOWN = 10
BACKLOG_HEADERS = {"late": "Pending late", "late_tracks": "late tracks"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MINUS = "\u2212"
DURATION_UNITS = (
    (86_400_000, "d", 3_600_000, "h"),
    (3_600_000, "h", 60_000, "min"),
    (60_000, "min", 1_000, "s"),
)
NONE = "\u2014"

ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="#1b7bb8" '
    'stroke-width="2" stroke-linecap="round"><path d="M2 9c2.5-2 4.5-2 7 0s4.5 2 7 0 4.5-2 6 0"/>'
    '<path d="M2 15c2.5-2 4.5-2 7 0s4.5 2 7 0 4.5-2 6 0"/><path d="M12 3v18" stroke-dasharray="2 2"/></svg>'
)

app = FastAPI(title="Tidemark", docs_url=None, redoc_url=None, openapi_url=None)
bearer = HTTPBearer(auto_error=False)


async def authorized_user(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Any:
    """The caller, if Airflow lets them see its UI; else 401/403, or a redirect
    to the login page for a browser that is not logged in."""
    # Imported here: seconds of imports the api-server has done already, while the
    # other Airflow processes that load plugins (scheduler, task workers) never serve this.
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import get_user

    try:
        user = await get_user(request, _oauth_token=None, bearer_credentials=credentials)
    except HTTPException as refused:
        if credentials is None and "text/html" in request.headers.get("accept", ""):
            login = get_auth_manager().get_url_login(next_url=str(request.url))
            raise HTTPException(HTTPStatus.SEE_OTHER, headers={"Location": login}) from refused
        raise
    if not get_auth_manager().is_authorized_view(access_view=AccessView.WEBSITE, user=user):
        raise HTTPException(HTTPStatus.FORBIDDEN, "not allowed to view Airflow's UI")
    return user


AuthorizedUser = Annotated[Any, Depends(authorized_user)]


@dataclass(frozen=True)
class PipelineView:
    """One configured pipeline file: its config and what the lakehouse says, or
    why the file does not load."""

    file: str
    config: PipelineConfig | None = None
    error: str | None = None
    status: dict[str, Any] | None = None


def kafka_backlog(root: str, config: PipelineConfig, now: datetime) -> dict[str, Any] | None:
    """Kafka lag per partition and whether bronze is stalled, by the idleness check's
    rule (the topic now against bronze's last report); None for a files source."""
    from spark_jobs.sources.kafka import KafkaLatestOffsets, kafka_backlog
    from spark_jobs.sources.progress import DEFAULT_STALL_AFTER_MS, REPORT_LOOKBACK, SourceProgress

    if config.source.kind != "kafka":
        return None
    metadata = lakehouse.last_user_metadata(root, "bronze", config.name, REPORT_LOOKBACK)
    report = SourceProgress.from_metadata(metadata)
    if report is None:
        return {"lag": {}, "stalled": None, "error": None}
    offsets = KafkaLatestOffsets(config.source.bootstrap_servers, config.source.topic, timeout_ms=2_000)
    try:
        backlog = kafka_backlog(report, offsets)
    except Exception as error:  # a page must render while Kafka is down
        return {"lag": {}, "stalled": None, "error": f"Kafka's offsets are unknown: {error}"}
    finally:
        offsets.close()
    return {"lag": backlog.lag, "stalled": backlog.stall(now, DEFAULT_STALL_AFTER_MS), "error": None}


def pipeline_status(root: str, config: PipelineConfig) -> dict[str, Any]:
    """What the page shows of one pipeline, read from the lakehouse."""
    name = config.name
    return {
        "kafka": kafka_backlog(root, config, datetime.now(UTC)),
        "watermark": lakehouse.pipeline_watermark(root, name),
        "partitions": lakehouse.partition_clocks(root, name),
        "backlog": lakehouse.quarantine_backlog_by_partition(root, name),
        "merges": lakehouse.recent_runs(root, name, job="merge_late", limit=MERGES_SHOWN),
        "history": lakehouse.watermark_history(root, name, limit=HISTORY_POINTS),
    }


def read_pipelines() -> tuple[str, list[PipelineView]]:
    """The lakehouse root and a view of every configured pipeline."""
    # Imported when serving: both load pyspark, which workers importing plugins need not.
    from spark_jobs.tables import lakehouse_root
    from tidemark_airflow.operators import pipeline_files

    root = lakehouse_root()
    views = []
    for file in pipeline_files().values():
        try:
            config = load_pipeline(file)
        except (ConfigError, OSError) as error:
            views.append(PipelineView(file, error=str(error)))
            continue
        views.append(PipelineView(file, config, status=pipeline_status(root, config)))
    return root, views


# Plain `def` handlers: the Delta reads block, so FastAPI runs them in its thread pool.


@app.get("/", response_class=HTMLResponse)
def page(user: AuthorizedUser) -> HTMLResponse:
    root, views = read_pipelines()
    return HTMLResponse(render_page(root, views, datetime.now(UTC)))


@app.get("/api/pipelines")
def pipelines_json(user: AuthorizedUser) -> list[dict[str, Any]]:
    root, views = read_pipelines()
    return jsonable_encoder(
        [
            {
                "pipeline": view.config.name if view.config else None,
                "file": view.file,
                "lakehouse": root,
                "error": view.error,
                **(view.status or {}),
            }
            for view in views
        ]
    )


@app.get("/icon.svg")
def icon() -> Response:
    # The navigation shows it on every page, and it tells nothing: no login needed.
    return Response(ICON, media_type="image/svg+xml")


def _e(value: object) -> str:
    return html.escape(str(value))


def format_time(moment: datetime | None) -> str:
    """``2026-01-01 00:19:59.066`` (UTC), or a dash for none."""
    if moment is None:
        return NONE
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def format_watermark(watermark: int | None) -> str:
    """-inf (before any data) and +inf (after the end of input) as such, any
    other watermark as its UTC time."""
    if watermark is None:
        return NONE
    if watermark == MIN_WATERMARK:
        return f"{MINUS}\u221e"
    if watermark == MAX_WATERMARK:
        return "+\u221e"
    try:
        return format_time(EPOCH + timedelta(milliseconds=watermark))
    except OverflowError:
        return f"{watermark} ms"


def format_duration(ms: int | None) -> str:
    """``850 ms``, ``4.2 s``, ``3 min 12 s``, ``5 h``, ``2 d 3 h``; signed."""
    if ms is None:
        return NONE
    sign, ms = (MINUS if ms < 0 else ""), abs(ms)
    if ms < 1_000:
        return f"{sign}{ms} ms"
    if ms < 60_000:
        return sign + f"{ms // 100 / 10}".removesuffix(".0") + " s"
    # Two units are precise enough for a lag or a setting.
    size, unit, part, part_unit = next(units for units in DURATION_UNITS if ms >= units[0])
    rest = ms % size // part
    return f"{sign}{ms // size} {unit}" + (f" {rest} {part_unit}" if rest else "")


def format_lag(lag_ms: int | None) -> str:
    """A partition's watermark against the pipeline's: behind, ahead, or holding it."""
    if lag_ms is None:
        return NONE
    if lag_ms == 0:
        return "holds it"
    return f"{format_duration(abs(lag_ms))} {'behind' if lag_ms > 0 else 'ahead'}"


def _millis(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def watermark_chart(history: Sequence[dict[str, Any]], width: int = 760, height: int = 240) -> str:
    """The watermark (y) against processing time (x) as an inline SVG step line
    (the watermark holds between steps), each step with a tooltip. -inf steps
    (before data) are not drawn; a step to +inf (end of input) is a dashed rise
    into a band above the finite range, marked +inf."""
    steps = [(_millis(row["processing_time"]), row["watermark"], row) for row in history]
    finite = [y for _, y, _ in steps if is_finite(y)]
    if not finite:
        return '<p class="empty">No finite watermark yet.</p>'
    left, right, top, bottom = 170, 20, 16, 40
    ceiling = top + (28 if any(y == MAX_WATERMARK for _, y, _ in steps) else 0)
    x_low, x_high = steps[0][0], steps[-1][0]
    y_low, y_high = min(finite), max(finite)
    x_span, y_span = max(x_high - x_low, 1), max(y_high - y_low, 1)

    def px(x: int) -> float:
        return left + (x - x_low) / x_span * (width - left - right)

    def py(y: int) -> float:
        return height - bottom - (y - y_low) / y_span * (height - ceiling - bottom)

    def mark(x: float, y: float, row: dict[str, Any]) -> str:
        tip = (
            f"batch {row['batch_id']} at {format_time(row['processing_time'])}: "
            f"watermark {format_watermark(row['watermark'])}; {row['active_partitions']} active, "
            f"{row['idle_partitions']} idle partitions; {row['on_time_count']} on time, "
            f"{row['late_count']} late"
        )
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5"><title>{_e(tip)}</title></circle>'

    path: list[str] = []
    marks: list[str] = []
    last_y: float | None = None
    for x, y, row in steps:
        if y == MAX_WATERMARK and last_y is not None:
            path.append(f"H{px(x):.1f}")
            marks.append(
                f'<line class="inf" x1="{px(x):.1f}" y1="{last_y:.1f}" x2="{px(x):.1f}" y2="{top}"/>'
                f'<text x="{px(x) - 6:.1f}" y="{top + 4}" text-anchor="end">+\u221e</text>'
                + mark(px(x), top, row)
            )
        if not is_finite(y):
            continue
        path.append(f"M{px(x):.1f},{py(y):.1f}" if last_y is None else f"H{px(x):.1f}V{py(y):.1f}")
        last_y = py(y)
        marks.append(mark(px(x), last_y, row))
    axis_y = height - bottom
    labels = (
        f'<text x="{left - 6}" y="{py(y_high) + 4:.1f}" text-anchor="end">'
        f"{_e(format_watermark(y_high))}</text>"
        f'<text x="{left - 6}" y="{py(y_low) + 4:.1f}" text-anchor="end">'
        f"{_e(format_watermark(y_low))}</text>"
        f'<text x="{left}" y="{axis_y + 16}">{_e(format_time(steps[0][2]["processing_time"]))}</text>'
        f'<text x="{width - right}" y="{axis_y + 16}" text-anchor="end">'
        f"{_e(format_time(steps[-1][2]['processing_time']))}</text>"
        f'<text x="{(left + width - right) / 2:.0f}" y="{axis_y + 32}" text-anchor="middle">'
        "processing time</text>"
    )
    return (
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        "<title>Watermark against processing time</title>"
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}"/>'
        f'<line class="axis" x1="{left}" y1="{axis_y}" x2="{width - right}" y2="{axis_y}"/>'
        f'<path class="line" d="{"".join(path)}"/>{"".join(marks)}{labels}</svg>'
    )


def _flag(on: bool, label: str, title: str = "") -> str:
    return f'<span class="flag {label}" title="{_e(title)}">{label}</span>' if on else ""


def _clock_rows(status: dict[str, Any]) -> str:
    backlog = status["backlog"]
    rows = []
    for clock in status["partitions"]:
        partition = clock["source_partition"]
        pending = " / ".join(str(counts.get(partition, 0)) for counts in backlog.values())
        lag = (status["kafka"] or {}).get("lag", {}).get(partition, 0)
        flags = (
            _flag(clock["is_idle"], "idle")
            + _flag(not clock["is_aligned"], "catching-up")
            + _flag(lag > 0, "lagging", f"{lag} records in Kafka not yet in bronze")
        )
        rows.append(
            f'<tr data-partition="{_e(partition)}"><td>{_e(partition)}</td>'
            f'<td class="watermark" title="{_e(clock["partition_watermark"])}">'
            f"{_e(format_watermark(clock['partition_watermark']))}</td>"
            f'<td class="num">{_e(format_lag(clock["lag_ms"]))}</td>'
            f"<td>{_e(format_time(clock['max_event_time']))}</td>"
            f"<td>{flags}</td>"
            f'<td class="num">{_e(pending or NONE)}</td>'
            f"<td>{_e(format_time(clock['last_data_at']))}</td>"
            f"<td>{_e(format_time(clock['updated_at']))}</td></tr>"
        )
    return "".join(rows)


def _count(value: int | None) -> str:
    return NONE if value is None else str(value)


def _merge_rows(merges: Sequence[dict[str, Any]]) -> str:
    return "".join(
        f'<tr class="{_e(run["status"])}"><td>{_e(format_time(run["started_at"]))}</td>'
        f"<td>{_e(run['status'])}</td>"
        f'<td class="num">{_e(format_duration(run["duration_ms"]))}</td>'
        f'<td class="num">{_count(run["rows_in"])}</td>'
        f'<td class="num">{_count(run["rows_out"])}</td>'
        f'<td class="message">{_e(run["message"] or "")}</td></tr>'
        for run in merges
    )


def _settings(config: PipelineConfig) -> str:
    watermark = config.watermark
    parts = [f"watermark {watermark.strategy}"]
    if watermark.strategy == "bounded":
        parts.append(f"out-of-orderness {format_duration(watermark.max_out_of_orderness_ms)}")
    idleness = watermark.idleness_ms
    parts.append("no idleness" if idleness is None else f"idleness {format_duration(idleness)}")
    parts.append(f"allowed lateness {format_duration(config.allowed_lateness_ms)}")
    return " \u00b7 ".join(parts)


def _kafka_summary(kafka: dict[str, Any] | None) -> str:
    if kafka is None:
        return ""
    if kafka["error"]:
        text = kafka["error"]
    elif kafka["lag"]:
        partitions = ", ".join(sorted(kafka["lag"], key=lambda p: (len(p), p)))
        text = f"{sum(kafka['lag'].values())} records on partitions {partitions} (backlog: never idle)"
    else:
        text = NONE
    stalled = f'<div><dt>Stalled</dt><dd class="stalled">{_e(kafka["stalled"])}</dd></div>'
    return f'<div><dt>Kafka lag</dt><dd class="kafka-lag">{_e(text)}</dd></div>' + (
        stalled if kafka["stalled"] else ""
    )


def render_pipeline(view: PipelineView) -> str:
    if view.config is None or view.status is None:
        return (
            f'<section class="pipeline broken"><h2>{_e(view.file)}</h2>'
            f'<p class="error">This pipeline file does not load: {_e(view.error)}</p></section>'
        )
    name, status = view.config.name, view.status
    backlog = status["backlog"]
    pending = ", ".join(f"{sum(counts.values())} {key.replace('_', ' ')}" for key, counts in backlog.items())
    idle = sum(1 for clock in status["partitions"] if clock["is_idle"])
    pending_header = " / ".join(BACKLOG_HEADERS[key] for key in backlog)
    clocks = (
        f'<table class="clocks" data-pipeline="{_e(name)}"><thead><tr><th>Partition</th>'
        "<th>Watermark</th><th>Vs pipeline</th><th>Max event time</th><th>Flags</th>"
        f"<th>{pending_header or 'Pending late'}</th><th>Last data</th><th>Updated</th></tr></thead>"
        f"<tbody>{_clock_rows(status)}</tbody></table>"
        if status["partitions"]
        else '<p class="empty">No partition clocks yet: silver has not run for this pipeline.</p>'
    )
    merges = (
        '<table class="merges"><thead><tr><th>Started</th><th>Status</th><th>Duration</th>'
        "<th>Records folded in</th><th>Windows</th><th>Message</th></tr></thead>"
        f"<tbody>{_merge_rows(status['merges'])}</tbody></table>"
        if status["merges"]
        else '<p class="empty">No late merge has run.</p>'
    )
    return (
        f'<section class="pipeline" id="pipeline-{_e(name)}"><h2>{_e(name)}</h2>'
        f'<p class="meta">{_e(view.file)} \u00b7 {_e(_settings(view.config))}</p>'
        '<dl class="summary">'
        f'<div><dt>Watermark</dt><dd class="watermark" title="{_e(status["watermark"])}">'
        f"{_e(format_watermark(status['watermark']))}</dd></div>"
        f"<div><dt>Partitions</dt><dd>{len(status['partitions'])} ({idle} idle)</dd></div>"
        f'<div><dt>Quarantine backlog</dt><dd class="backlog">{_e(pending or NONE)}</dd></div>'
        f"{_kafka_summary(status['kafka'])}</dl>"
        f"<h3>Partitions</h3>{clocks}"
        f"<h3>Watermark against processing time</h3>{watermark_chart(status['history'])}"
        f"<h3>Recent late merges</h3>{merges}</section>"
    )


STYLE = """
:root { color-scheme: light dark; --muted: #6b7280; --line: #1b7bb8; --rule: #d1d5db; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.2rem 1.6rem; }
h1 { font-size: 1.4rem; margin: 0 0 .2rem; } h2 { margin: 1.6rem 0 .2rem; } h3 { margin: 1.2rem 0 .4rem; }
.meta, .empty, footer { color: var(--muted); }
.summary { display: flex; gap: 2.5rem; margin: .8rem 0; } .summary dt { color: var(--muted); }
.summary dd { margin: 0; font-size: 1.15rem; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .25rem .7rem; white-space: nowrap; border-bottom: 1px solid var(--rule); text-align: left; }
td.num { text-align: right; } td.message { white-space: normal; min-width: 20rem; }
.flag { border-radius: .6rem; padding: 0 .45rem; margin-right: .3rem; font-size: .8rem; }
.flag.idle { background: #fde68a; color: #78350f; } .flag.lagging { background: #fecaca; color: #7f1d1d; }
.flag.catching-up { background: #bfdbfe; color: #1e3a8a; }
tr.failed td, .error { color: #b91c1c; }
.chart text { font-size: 11px; fill: currentColor; } .chart .axis { stroke: var(--muted); }
.chart .line { fill: none; stroke: var(--line); stroke-width: 2; } .chart circle { fill: var(--line); }
.chart .inf { stroke: var(--line); stroke-dasharray: 4 3; }
"""


def render_page(root: str, views: Sequence[PipelineView], now: datetime) -> str:
    body = "".join(render_pipeline(view) for view in views) or (
        '<p class="empty">No pipeline files: set TIDEMARK_PIPELINES.</p>'
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Tidemark watermarks</title>'
        f"<style>{STYLE}</style></head><body><h1>Tidemark watermarks</h1>"
        f'<p class="meta">Lakehouse {_e(root)} \u00b7 times in UTC \u00b7 read at {_e(format_time(now))}</p>'
        f"{body}<footer><p>Each source partition has its own watermark; the pipeline's is the minimum "
        "over active partitions, so one partition holds it and the others are ahead. Idle partitions "
        "do not count and may trail it. A partition catching up became active again: it rejoins the "
        "minimum once its watermark reaches the pipeline's.</p></footer></body></html>"
    )
