"""Example: an hourly report that runs only once its hour is complete in event
time. Airflow's data interval meets the watermark: the sensor waits until the
pipeline's watermark has passed the interval's end, then the report reads the
gold rows of that hour. Late records still merge in later (tidemark_late_merge)."""

from datetime import datetime, timedelta

from airflow.sdk import CronTriggerTimetable, dag, task
from tidemark_airflow.operators import dag_settings, pipeline_param
from tidemark_airflow.sensors import WatermarkSensor


@dag(
    dag_id="tidemark_hourly_report",
    # An hour's run covers the hour before its tick: a cron schedule alone gives Airflow 3
    # an empty data interval (start = end = the tick), and the report would read the
    # hour just beginning.
    schedule=CronTriggerTimetable("@hourly", timezone="UTC", interval=timedelta(hours=1)),
    doc_md=__doc__,
    params={"pipeline": pipeline_param()},
    **dag_settings("example"),
)
def tidemark_hourly_report() -> None:
    hour_complete = WatermarkSensor(
        task_id="hour_complete_in_event_time",
        pipeline="{{ params.pipeline }}",
        moment="{{ data_interval_end }}",
        timeout=timedelta(hours=6).total_seconds(),
    )

    @task
    def report(data_interval_start: datetime | None = None, params: dict | None = None) -> list[dict]:
        from tidemark_airflow.lakehouse import as_utc, table_rows
        from tidemark_airflow.operators import pipeline_file

        from spark_jobs.config import load_pipeline
        from spark_jobs.tables import TableRegistry

        registry = TableRegistry(load_pipeline(pipeline_file(params["pipeline"])))
        if registry.gold is None:
            return []
        hour = [
            row
            for row in table_rows(registry.root, "gold", registry.gold.name)
            if as_utc(row["grain_start"]) == data_interval_start
        ]
        for row in hour:
            print(row)
        return [{key: str(value) for key, value in row.items()} for row in hour]

    hour_complete >> report()


tidemark_hourly_report()
