"""The library's test plugin: markers, and a clean Hydra state around each test."""

pytest_plugins = ["fasttrain.testing.plugin"]
