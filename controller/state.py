"""The desired state read from a file or a document: `load(path)` and `parse(doc)` validate
the switches, workers and flat jobs (controller/model.py, which has the YAML format) and a
`fabric:` section of two-level jobs (controller/plan.py). Every error names the field. (The
software switch's own files become desired states in controller/softswitch_files.py.)
"""
from __future__ import annotations

import pathlib

from controller import plan
from controller.model import DesiredState, load_yaml, parse_flat


def load(path) -> DesiredState:
    """The desired state in the YAML file `path` (flat jobs and a fabric section); every error
    names the file."""
    return load_yaml(path, parse)


def parse(doc, path: pathlib.Path | None = None) -> DesiredState:
    """The desired state in `doc` (a YAML document), validated; ConfigError names the field. A
    `fabric:` section (two-level jobs, controller/plan.py) is parsed there and kept as `fabric`."""
    if isinstance(doc, dict) and "fabric" in doc:
        state = plan.parse(doc, path).state
    else:
        state = parse_flat(doc, path)
    state.parser = parse
    return state
