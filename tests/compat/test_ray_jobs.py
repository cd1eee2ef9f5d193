"""Defect 26: Ray names its job-config variable only privately; ``levanter_mars.compat.ray_jobs`` names it."""


def test_defect_26_ray_names_the_job_config_variable_only_privately():
    import ray.job_submission

    from levanter_mars.compat.ray_jobs import RAY_JOB_CONFIG_JSON_ENV_VAR

    assert RAY_JOB_CONFIG_JSON_ENV_VAR == "RAY_JOB_CONFIG_JSON_ENV_VAR"
    public = [getattr(module, name) for module in (ray, ray.job_submission) for name in dir(module)]
    assert RAY_JOB_CONFIG_JSON_ENV_VAR not in [v for v in public if isinstance(v, str)]
