"""Every public error lives in `stello_graph.errors`, in its `__all__` and its drawn tree."""

from __future__ import annotations

import re

import pytest

import stello_graph
from stello_graph import errors, profiles, skills


def _public_errors() -> list[type[BaseException]]:
    found = (getattr(stello_graph, name) for name in stello_graph.__all__ if name != "__version__")
    return [v for v in found if isinstance(v, type) and issubclass(v, errors.StelloError)]


@pytest.mark.parametrize("error", _public_errors(), ids=lambda e: e.__name__)
def test_public_errors_are_defined_in_errors(error: type[BaseException]) -> None:
    assert error.__module__ == "stello_graph.errors"
    assert error.__name__ in errors.__all__
    drawn = re.search(rf"[─ ]{error.__name__}\b", errors.__doc__ or "")
    assert drawn is not None, "missing from the hierarchy drawn in the docstring"


def test_every_error_of_the_module_is_public() -> None:
    assert set(errors.__all__) <= set(stello_graph.__all__)


def test_old_homes_re_export_the_same_classes() -> None:
    assert profiles.UnknownProfileError is errors.UnknownProfileError
    assert profiles.SplitGuardError is errors.SplitGuardError
    assert skills.SkillLoadError is errors.SkillLoadError


def test_where_the_moved_errors_sit() -> None:
    assert issubclass(errors.UnknownProfileError, errors.StelloUsageError)
    assert issubclass(errors.UnknownProfileError, LookupError)
    assert issubclass(errors.SkillLoadError, errors.InvalidInputError)
    assert issubclass(errors.SplitGuardError, errors.TopologyError)
    assert "'nope'" in str(errors.UnknownProfileError("nope", ["a"]))
