"""The library's generic tests, for this repository and for every project made from it.

A project's tests/conftest.py loads the plugin (`pytest_plugins = ["fasttrain.testing.plugin"]`)
and its tests/test_fasttrain.py imports the tests (`from fasttrain.testing.configs import *`,
`from fasttrain.testing.tasks import *`). They read the project's conf/ (fasttrain.CONFIG_DIR):
every file there is composed, instantiated and smoke-run (`configs`), and every task x each of
its nets goes through a checkpoint round trip, a short run, evaluate, export, predict and a
resumed run (`tasks`). A net, data set or task the project adds under conf/ is tested the day it
is added, with no test code; the tests come with each fasttrain version.
"""
