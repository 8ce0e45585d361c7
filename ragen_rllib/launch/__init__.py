"""Launching training on a running Ray cluster (Ray Jobs API).

Import-light: Ray's job SDK is imported only inside ``ragen_rllib.launch.jobs``'s functions, so
importing this package (or the CLI) loads neither ray nor requests.
"""

from ragen_rllib.launch.jobs import (
    DEFAULT_EXCLUDES,
    JOB_ID_ENV,
    JobsError,
    current_job_id,
    follow_logs,
    job_info,
    job_logs,
    job_status,
    list_jobs,
    new_submission_id,
    stop_job,
    submit_training,
    training_entrypoint,
    training_runtime_env,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "JOB_ID_ENV",
    "JobsError",
    "current_job_id",
    "follow_logs",
    "job_info",
    "job_logs",
    "job_status",
    "list_jobs",
    "new_submission_id",
    "stop_job",
    "submit_training",
    "training_entrypoint",
    "training_runtime_env",
]
