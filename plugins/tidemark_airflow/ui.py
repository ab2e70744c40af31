"""The Tidemark page in Airflow's UI: per configured pipeline, the combined
watermark, each stream's liveness (from ``ops.runs`` and its checkpoint) and its
Airflow runs, every source partition's clock (watermark, lag, idle and catching-up
flags, pending late records), the quarantine backlog with a button that triggers
``tidemark_late_merge``, rejects by reason, the recent late merges, and charts of
the watermark, each partition's lag and the late share per batch over time.

A FastAPI app that Airflow's api-server mounts at ``/tidemark`` (see
``tidemark_plugin.py``); the UI shows it in an iframe from its navigation. The
HTML comes from Jinja templates with autoescaping (``templates/``), charts are
inline SVG, and the page refreshes itself with a meta refresh: no JavaScript,
nothing fetched from elsewhere. ``GET /tidemark/api/pipelines`` returns the data
as JSON. Pipelines without data collapse into one line each.

Only users whom Airflow lets see its UI get the data, authenticated exactly as
the REST API authenticates them: a bearer token from ``POST /auth/token``, else
the ``_token`` cookie the UI sets at login. A browser without a valid login is
sent to Airflow's login page; any other caller gets 401 or 403. The merge button
and the run links go through Airflow's REST API with the caller's own token, so
Airflow's permissions decide what they may trigger and see.

Pipelines are the files of ``$TIDEMARK_PIPELINES`` (as the DAGs see them); the
lakehouse is ``$LAKEHOUSE_DIR``. Times are shown in UTC.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from jinja2 import Environment, FileSystemLoader, select_autoescape

from spark_jobs.config import ConfigError, PipelineConfig, load_pipeline
from spark_jobs.eventtime.windows import SessionSpec
from tidemark_airflow import charts, lakehouse, rest
from tidemark_airflow.health import STALL_AFTER, Liveness, liveness
from tidemark_airflow.lakehouse import EPOCH, MAX_WATERMARK, MIN_WATERMARK, is_finite

URL_PREFIX = "/tidemark"
HISTORY_POINTS = 500
MERGES_SHOWN = 10
REFRESH_S = 10
REJECTS_SINCE = timedelta(hours=24)
# A running stream is quiet after this long without a batch.
QUIET_AFTER = timedelta(minutes=10)
RUN_DAGS = ("tidemark_streaming", "tidemark_late_merge")
RUNS_SHOWN = 3  # of each DAG
MERGE_DAG = "tidemark_late_merge"
BACKLOG_HEADERS = {"late": "Pending late", "late_tracks": "late tracks"}
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
    # Imported here: heavy imports the api-server has done already, while the
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


def caller_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> str | None:
    """The token the caller authenticated with, to call Airflow's REST API as them."""
    return credentials.credentials if credentials else request.cookies.get("_token")


CallerToken = Annotated[str | None, Depends(caller_token)]


@dataclass(frozen=True)
class PipelineView:
    """One configured pipeline file (``key`` is its configured name, the DAGs'
    ``pipeline`` Param): its config and what the lakehouse says, or why the file
    does not load."""

    key: str
    file: str
    config: PipelineConfig | None = None
    error: str | None = None
    status: dict[str, Any] | None = None
    dag_runs: list[dict[str, Any]] = field(default_factory=list)


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


def stream_jobs(config: PipelineConfig) -> list[str]:
    """The pipeline's streams, in dependency order."""
    return ["bronze", "silver", *(["gold"] if config.gold else []), *(["offline"] if config.offline else [])]


def stream_liveness(root: str, config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Per stream: its newest run in ``ops.runs`` and what its checkpoint says."""
    from spark_jobs.tables import join

    jobs = stream_jobs(config)
    runs = lakehouse.latest_runs(root, config.name, jobs)
    checkpoints = join(root, "_checkpoints", config.name)
    return {job: {"run": runs.get(job), "live": liveness(join(checkpoints, job))} for job in jobs}


def pipeline_status(root: str, config: PipelineConfig, now: datetime) -> dict[str, Any]:
    """What the page shows of one pipeline, read from the lakehouse."""
    name = config.name
    return {
        "kafka": kafka_backlog(root, config, now),
        "watermark": lakehouse.pipeline_watermark(root, name),
        "partitions": lakehouse.partition_clocks(root, name),
        "backlog": lakehouse.quarantine_backlog_by_partition(root, name),
        "merges": lakehouse.recent_runs(root, name, job="merge_late", limit=MERGES_SHOWN),
        "history": lakehouse.watermark_history(root, name, limit=HISTORY_POINTS),
        "rejects": lakehouse.rejects_by_reason(root, name, now - REJECTS_SINCE),
        "streams": stream_liveness(root, config),
        "tuning": lakehouse.latest_tuning(root, name),
    }


def read_pipelines(now: datetime) -> tuple[str, list[PipelineView]]:
    """The lakehouse root and a view of every configured pipeline."""
    # Imported when serving: both load pyspark, which workers importing plugins need not.
    from spark_jobs.tables import lakehouse_root
    from tidemark_airflow.operators import pipeline_files

    root = lakehouse_root()
    views = []
    for key, file in pipeline_files().items():
        try:
            config = load_pipeline(file)
        except (ConfigError, OSError) as error:
            views.append(PipelineView(key, file, error=str(error)))
            continue
        views.append(PipelineView(key, file, config, status=pipeline_status(root, config, now)))
    return root, views


def api_url(request: Request, path: str) -> str:
    """Airflow's REST API (``request.base_url`` is Airflow's root, with its base path)."""
    return f"{request.base_url}api/v2/{path}"


def run_href(dag_id: str, run_id: str) -> str:
    """A DAG run's page in Airflow's UI, relative to this page."""
    return f"../dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def recent_dag_runs(request: Request, token: str | None, key: str) -> list[dict[str, Any]]:
    """The latest runs of each of the streaming and merge DAGs for pipeline ``key``,
    newest first, as the caller may see them (none if Airflow refuses or is unreachable)."""
    from tidemark_airflow.operators import default_pipeline

    default = default_pipeline()
    found = []
    for dag_id in RUN_DAGS:
        try:
            response = httpx.get(
                api_url(request, f"dags/{dag_id}/dagRuns"),
                params={"order_by": "-run_after", "limit": 25},
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
        except httpx.HTTPError:
            continue
        if response.status_code != HTTPStatus.OK:
            continue
        runs = [
            run
            for run in response.json()["dag_runs"]
            if ((run.get("conf") or {}).get("pipeline") or default) == key
        ]
        found += [
            {
                **run,
                "run_after": datetime.fromisoformat(run["run_after"]),
                "href": run_href(dag_id, run["dag_run_id"]),
            }
            for run in runs[:RUNS_SHOWN]
        ]
    return sorted(found, key=lambda run: run["run_after"], reverse=True)


# Plain `def` handlers: the Delta reads block, so FastAPI runs them in its thread pool.


@app.get("/", response_class=HTMLResponse, name="tidemark_page")
def page(
    request: Request,
    user: AuthorizedUser,
    token: CallerToken,
    refresh: int = REFRESH_S,
    merged: str | None = None,
    run: str | None = None,
    merge_refused: str | None = None,
    why: str | None = None,
) -> HTMLResponse:
    now = datetime.now(UTC)
    notice = merge_notice(merged, run, merge_refused, why)
    try:
        root, views = read_pipelines(now)
    except Exception as error:  # the page keeps refreshing: it shows the data once it reads again
        from spark_jobs.tables import lakehouse_root

        failed = {"kind": "error", "text": f"Reading the lakehouse failed: {error}"}
        html = render_page(lakehouse_root(), [], now, max(refresh, 0), failed)
        return HTMLResponse(html, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
    views = [
        PipelineView(**{**view.__dict__, "dag_runs": recent_dag_runs(request, token, view.key)})
        if view.status and has_data(view.status)
        else view
        for view in views
    ]
    return HTMLResponse(render_page(root, views, now, max(refresh, 0), notice))


def merge_notice(
    merged: str | None, run: str | None, refused: str | None, why: str | None = None
) -> dict[str, str] | None:
    """What the page says after its merge button was pressed."""
    if merged and run:
        return {
            "kind": "ok",
            "text": f"Late merge triggered for {merged}:",
            "href": run_href(MERGE_DAG, run),
            "link": run,
        }
    if refused:
        reason = f": {why}" if why else ""
        return {"kind": "error", "text": f"Airflow refused the late merge for {refused}{reason}."}
    return None


@app.post("/pipelines/{key}/merge")
def trigger_merge(key: str, request: Request, user: AuthorizedUser, token: CallerToken) -> RedirectResponse:
    """Trigger ``tidemark_late_merge`` for pipeline ``key`` as the caller, then back to the page."""
    from tidemark_airflow.operators import pipeline_files

    # A form posted from another site would carry the login cookie: only this host may
    # post (by host, not scheme: a TLS proxy in front may hand the api-server plain HTTP).
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise HTTPException(HTTPStatus.FORBIDDEN, "cross-origin form")
    if origin is None and request.headers.get("sec-fetch-site") not in (None, "same-origin"):
        raise HTTPException(HTTPStatus.FORBIDDEN, "cross-origin form")
    if key not in pipeline_files():
        raise HTTPException(HTTPStatus.NOT_FOUND, f"no configured pipeline {key!r}")
    try:
        run = rest.trigger(str(request.base_url), MERGE_DAG, {"pipeline": key}, token)
    except (urllib.error.URLError, TimeoutError) as error:
        query = {"merge_refused": key, "why": rest.refusal(error)}
    else:
        query = {"merged": key, "run": run}
    return RedirectResponse(f"../../?{urlencode(query)}", status_code=HTTPStatus.SEE_OTHER)


@app.get("/api/pipelines")
def pipelines_json(user: AuthorizedUser) -> list[dict[str, Any]]:
    root, views = read_pipelines(datetime.now(UTC))
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


def format_count(value: int | None) -> str:
    return NONE if value is None else str(value)


def has_data(status: dict[str, Any]) -> bool:
    """Whether the pipeline ever ran: anything to show beyond one line."""
    backlog = lakehouse.pending_late(lakehouse.backlog_totals(status["backlog"]))
    streams = any(s["run"] or s["live"].last_commit is not None for s in status["streams"].values())
    return bool(status["partitions"] or status["history"] or status["merges"] or backlog or streams)


def stream_state(run: dict[str, Any] | None, live: Liveness, now: float) -> str:
    """live, quiet (running, no batch for a while), stalled (a batch past the
    watchdog's limit), stopped, failed or not-started."""
    if live.is_stalled(STALL_AFTER, now):
        return "stalled"
    if run is None:
        return "not-started" if live.last_commit is None else "stopped"
    if run["status"] == "failed":
        return "failed"
    if run["status"] != "running":
        return "stopped"
    last_seen = max(filter(None, (live.committed_at, live.running_since)), default=None)
    return "live" if last_seen is not None and now - last_seen <= QUIET_AFTER.total_seconds() else "quiet"


def settings_text(config: PipelineConfig) -> str:
    watermark = config.watermark
    parts = [f"watermark {watermark.strategy}"]
    if watermark.strategy == "bounded":
        parts.append(f"out-of-orderness {format_duration(watermark.max_out_of_orderness_ms)}")
    if watermark.generator is not None:
        parts.append(f"generator {watermark.generator}")
    idleness = watermark.idleness_ms
    parts.append("no idleness" if idleness is None else f"idleness {format_duration(idleness)}")
    parts.append(f"allowed lateness {format_duration(config.allowed_lateness_ms)}")
    return " \u00b7 ".join(parts)


def kafka_text(kafka: dict[str, Any]) -> str:
    if kafka["error"]:
        return kafka["error"]
    if kafka["lag"]:
        partitions = ", ".join(sorted(kafka["lag"], key=lambda p: (len(p), p)))
        return f"{sum(kafka['lag'].values())} records on partitions {partitions} (backlog: never idle)"
    return NONE


def present(view: PipelineView, now: datetime) -> dict[str, Any]:
    """What the template shows of one pipeline: its view and what derives from it."""
    shown: dict[str, Any] = {**view.__dict__, "has_data": False}
    if view.status is None or view.config is None:
        return shown
    status = view.status
    backlog = status["backlog"]
    totals = lakehouse.backlog_totals(backlog)
    kafka = status["kafka"] or {}
    at = now.timestamp()
    history = status["history"]
    made = (
        charts.watermark_chart(history, format_time, format_watermark),
        charts.lag_chart(history, format_time, format_lag),
        charts.late_share_chart(history, format_time),
        charts.tradeoff_chart(status["tuning"], format_duration, isinstance(view.config.window, SessionSpec)),
    )
    shown.update(
        has_data=has_data(status),
        settings=settings_text(view.config),
        fired=_last_fired(view.config, status["watermark"]),
        idle=sum(1 for clock in status["partitions"] if clock["is_idle"]),
        pending=lakehouse.pending_late(totals),
        backlog_text=", ".join(f"{count} {key.replace('_', ' ')}" for key, count in totals.items()) or NONE,
        pending_header=" / ".join(BACKLOG_HEADERS[key] for key in backlog) or "Pending late",
        kafka_text=kafka_text(kafka) if kafka else None,
        clock_rows=[
            {
                "clock": clock,
                "pending": " / ".join(str(c.get(clock["source_partition"], 0)) for c in backlog.values())
                or NONE,
                "kafka_lag": kafka.get("lag", {}).get(clock["source_partition"], 0),
            }
            for clock in status["partitions"]
        ],
        streams=[
            {
                "job": job,
                "run": stream["run"],
                "live": stream["live"],
                "state": stream_state(stream["run"], stream["live"], at),
                "committed_ago": _ago(stream["live"].committed_at, at),
                "running_for": _ago(stream["live"].running_since, at),
            }
            for job, stream in status["streams"].items()
        ],
        charts=[chart for chart in made if chart is not None],
    )
    return shown


def _last_fired(config: PipelineConfig, watermark: int | None) -> str:
    """The newest window the watermark has fired, as ``[start, end)``."""
    if watermark == MAX_WATERMARK:
        return "all (end of input)"
    if not is_finite(watermark):
        return NONE
    if isinstance(config.window, SessionSpec):
        return f"sessions ending by {format_watermark(watermark + 1)}"
    window = config.window.last_fired(watermark)
    to_time = (format_watermark(moment) for moment in (window.start, window.end))
    return "[{}, {})".format(*to_time)


def _ago(moment: float | None, now: float) -> int | None:
    return None if moment is None else max(int((now - moment) * 1000), 0)


TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.filters.update(
    time=format_time,
    watermark=format_watermark,
    duration=format_duration,
    lag=format_lag,
    count=format_count,
)


def render_page(
    root: str,
    views: Sequence[PipelineView],
    now: datetime,
    refresh: int = REFRESH_S,
    notice: dict[str, str] | None = None,
) -> str:
    return TEMPLATES.get_template("page.html").render(
        root=root,
        views=[present(view, now) for view in views],
        now=now,
        refresh=refresh,
        default_refresh=REFRESH_S,
        notice=notice,
    )
