"""Each side of an A/B comparison in its own environment: detect how the sides' dependencies differ, build each
side's environment with uv into a cache, or say why not.

    from pytest_llmperf.environments.detection import detect
    from pytest_llmperf.environments.plan import prepare

    detection = detect(base_root, head_root, extra)   # cheap; nothing is built, no process started
    environments = prepare(detection, mode="auto")    # an Environments record; CannotBuild with the ways out

The public names, by module: detection (detect, Detection), plan (prepare), records (Environments, SideEnvironment,
PackageChange, BuildSettings, COMPARE_DEPS_MODES, unmeasured), errors (EnvironmentsError, CannotBuild, BuildFailed),
installed (imported_distributions, check_imported, probe), cache (default_env_dir). This file imports none of them:
the options table reads records.py at plugin load, which must cost nothing. Those modules use the standard library;
the parsers (packaging, tomllib) and uv are reached only when the dependencies differ. docs/environments.md says
what is built, what is measured, and the ways out.
"""
