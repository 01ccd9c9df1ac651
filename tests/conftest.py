import os

from hypothesis import HealthCheck, settings

# CI runs a fixed, derandomized set of examples so a red build is reproducible;
# locally each run explores new inputs.
settings.register_profile(
    "ci", derandomize=True, max_examples=300, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
