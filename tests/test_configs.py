"""Every YAML under conf/ composes, its `_target_`s instantiate, and it smoke-runs (principle 5):
the library's generic tests (fasttrain.testing.configs), which every project runs too."""

from fasttrain.testing.configs import *  # noqa: F403
