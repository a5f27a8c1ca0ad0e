"""Root conftest: the plugin's own test suite drives pytest in-process with pytester."""

pytest_plugins = ["pytester"]
