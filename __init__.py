"""The root of the codesearch *repository*, not the package (that is ``codesearch/`` inside).

Python run from a folder that holds this clone as ``./codesearch`` finds this folder first
when it imports ``codesearch``: without this file it would import it as an empty namespace
package and fail later with ``ImportError: cannot import name ... (unknown location)``.
Here the import either goes on with the installed package, when this Python has one
elsewhere on its path, or stops with one line that says what happened and the way out.
Nothing imports this file in any other case (it is not part of the installed package).
"""

import importlib.util
import os
import sys
from importlib.machinery import PathFinder


def _installed_elsewhere():
    """The spec the import would have found without the folder holding this clone on the
    path (a site-packages folder, an editable install's finder), or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    holder = os.path.realpath(os.path.dirname(here))
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != holder]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(__name__, others if finder is PathFinder else None)
        origin = getattr(spec, "origin", None)
        if origin and os.path.realpath(os.path.dirname(origin)) != os.path.realpath(here):
            return spec
    return None


# Only an import of the package's name (a tool that imports this file by path, as pytest does
# for a test run's root folder, gets an empty module).
if __name__ == "codesearch":
    _spec = _installed_elsewhere()
    if _spec is None or _spec.loader is None:
        _clone = os.path.dirname(os.path.abspath(__file__))
        raise ImportError(
            f"'{__name__}' here is the cloned repository {_clone}, not the installed package "
            f"(run Python from another folder, rename the clone: mv {_clone} {_clone}-src, "
            f"or install the package into this Python: pip install {_clone})"
        )
    # The installed package replaces this module: `import` hands back what sys.modules holds.
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module
    _spec.loader.exec_module(_module)
