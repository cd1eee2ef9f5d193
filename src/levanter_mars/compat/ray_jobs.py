"""Defect 26: Ray hands a job's driver the job's config (its metadata, where the launcher carries credentials, see
``levanter_mars.infra.pod.take_secrets``) only through an environment variable whose name Ray keeps private."""

from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

__all__ = ["RAY_JOB_CONFIG_JSON_ENV_VAR"]
