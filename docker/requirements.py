"""Print what an image installs besides fedasync, one requirement a line, from pyproject.toml.

    python requirements.py [--pyproject PATH] [--build] [EXTRA ...]

The project's dependencies, then those of each EXTRA; with --build, its build requirements
first. One list, two readers: the Dockerfiles install it in a layer of its own before they copy
the code (a change to the code alone then rebuilds in seconds), and docker/wheelhouse.sh puts a
wheel of each into docker/wheels/ for builds without a package index.
"""

from __future__ import annotations

import argparse
import tomllib


def requirements(pyproject: str, extras: list[str], build: bool) -> list[str]:
    with open(pyproject, "rb") as f:
        data = tomllib.load(f)
    project = data["project"]
    wanted = list(data["build-system"]["requires"]) if build else []
    wanted += project["dependencies"]
    for extra in extras:
        wanted += project["optional-dependencies"][extra]  # an unknown extra: KeyError, loudly
    return list(dict.fromkeys(wanted))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", default="pyproject.toml")
    parser.add_argument("--build", action="store_true", help="the build requirements too")
    parser.add_argument("extras", nargs="*")
    args = parser.parse_args()
    print("\n".join(requirements(args.pyproject, args.extras, args.build)))


if __name__ == "__main__":
    main()
