"""Each side of an A/B comparison in its own environment: detect by bytes whether the sides' dependency inputs differ,
build each side's environment with uv into a cache where they do, compare what the two hold, or say why not.

    from pytest_llmperf.environments.inputs import detect
    from pytest_llmperf.environments.plan import prepare

    detection = detect(base_root, head_root, extra)   # bytes only; nothing built, no process started
    environments = prepare(detection, mode="auto")    # an Environments record; CannotBuild with the ways out

The public names, by module: inputs (detect, Detection), plan (prepare), records (Environments, SideEnvironment,
PackageChange, BuildSettings, COMPARE_DEPS_MODES), errors (EnvironmentsError, CannotBuild, BuildFailed), installed
(imported_distributions, check_imported, probe), cache (default_env_dir). This file imports none of them: the
options table reads records.py at plugin load, which must cost nothing. docs/environments.md says how an environment
is named, reused and compared, and the ways out.
"""
