"""Every task x each of its nets through a checkpoint round trip, a short run, evaluate, export,
predict and a resumed run: the library's generic tests (fasttrain.testing.tasks), which every
project runs too."""

from fasttrain.testing.tasks import *  # noqa: F403
