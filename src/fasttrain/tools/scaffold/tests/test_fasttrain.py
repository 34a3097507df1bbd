"""The library's generic tests, run on this project's conf/: every config file composed,
instantiated and smoke-run; every task x each of its nets through a checkpoint round trip, a short
run, evaluate, export, predict and a resumed run. A net, data set or task added under conf/ is
tested here the day it is added; the tests come with each fasttrain version."""

from fasttrain.testing.configs import *  # noqa: F403
from fasttrain.testing.tasks import *  # noqa: F403
