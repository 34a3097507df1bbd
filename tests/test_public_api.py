"""The public API (`fasttrain.PUBLIC`): what a project's own code imports, as
`from fasttrain import Task`. Each name resolves to the object its module defines, importing the
package stays cheap, the version is one number everywhere, and the examples of README.md and
docs/ import only these names."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import import_module

import pytest
import tomllib

import fasttrain
from conftest import REPO, all_docs

PACKAGE = fasttrain.__name__  # (a generated project renames it)


@pytest.mark.parametrize("name", sorted(fasttrain.PUBLIC))
def test_each_public_name_is_its_modules_object(name: str) -> None:
    module = fasttrain.PUBLIC[name]
    assert module.startswith(f"{PACKAGE}."), module
    assert getattr(fasttrain, name) is getattr(import_module(module), name)
    assert name in fasttrain.__all__ and name in dir(fasttrain)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Tsak'"):
        fasttrain.Tsak  # noqa: B018


def test_importing_the_package_loads_no_framework() -> None:
    # `python train.py --help` answers in well under a second because of this
    code = f"import sys, {PACKAGE}; print(sorted({{'torch', 'lightning'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_version_is_one_number_in_the_package_pyproject_changelog_and_copier_yml() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert fasttrain.__version__ == project["version"]
    newest = re.search(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None and newest.group(1) == fasttrain.__version__
    # what a new project pins (copier.yml's fasttrain_version)
    copier = (REPO / "copier.yml").read_text()
    pinned = re.search(r'^fasttrain_version:\n(?:  .*\n)*?  default: "(.+)"', copier, re.M)
    assert pinned is not None and pinned.group(1) == fasttrain.__version__


def test_the_docs_examples_import_only_public_names() -> None:
    code = "\n".join(re.findall(r"```python\n(.*?)```", all_docs(), re.S))
    imports = re.findall(rf"^from ({PACKAGE}\S*) import (.+)$", code, re.M)
    assert imports, "the examples in README.md and docs/ import nothing of the package"
    for module, names in imports:
        assert module == PACKAGE, f"from {module} import {names}: import it from {PACKAGE}"
        assert {n.strip() for n in names.split(",")} <= set(fasttrain.PUBLIC), names
