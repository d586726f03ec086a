"""The wheel's packages, derived from the layer list in pyproject.toml.

Each layer folder installs as ``refinery.<folder>`` (``refinery/`` as ``refinery``)
with every folder below it, data folders included (``ui/templates``), so a new
subpackage ships without a line here and no folder of data is left out of the
``packages`` configuration (setuptools warns about those). Everything else is in
pyproject.toml.
"""

import sys
import warnings
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.warnings import InformationOnly

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the build requirement brings it there
    import tomli as tomllib

HERE = Path(__file__).parent
LAYERS = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))[
    "tool"]["refinery"]["layers"]
FOLDERS = [folder for layer in LAYERS for folder in layer]
PACKAGE_DIR = {folder if folder == "refinery" else f"refinery.{folder}": folder
               for folder in FOLDERS}
PACKAGES = [found for name, folder in PACKAGE_DIR.items()
            for found in [name, *(f"{name}.{sub}" for sub in find_namespace_packages(
                str(HERE / folder), exclude=["__pycache__", "*.__pycache__"]))]]

# setuptools tells how it made an editable install through a warning (it has no
# other channel, says InformationOnly); with this layout there is nothing to act on.
warnings.filterwarnings("ignore", category=InformationOnly)

setup(package_dir=PACKAGE_DIR, packages=PACKAGES)
