# BUILD-file macros (pants.toml [GLOBAL].build_file_prelude_globs): every BUILD file sees them.
# Not a python_sources target: Pants evaluates this file itself, with the BUILD-file symbols
# (build_file_dir, python_sources, ...) as globals, and no linter reads it.


def stage_package(provides, cli_dependencies=(), sources_dependencies=(), dist_dependencies=()):
    """A pipeline package's targets, named as every package's: its sources, `tests`, the CLI PEX
    `cli` (entry point `cli.py:main`) and the wheel `dist`, whose console script is the
    distribution's name (`qnn-quant` runs `qnn_quant.cli:main`).

    `provides` stays a python_artifact(...) written in the BUILD file: the release tooling reads
    the name and version from there (build-support/version_policy.py). The dependency rules stay
    in each BUILD file too, where the architecture is read. `dist_dependencies`: subpackages the
    package's own modules do not import but its users do (the wheel must hold them).
    """
    package = build_file_dir().name
    python_sources(dependencies=list(sources_dependencies))
    python_tests(name="tests")
    pex_binary(name="cli", entry_point="cli.py:main", dependencies=list(cli_dependencies))
    python_distribution(
        name="dist",
        dependencies=[f":{package}", *dist_dependencies],
        provides=provides,
        entry_points={"console_scripts": {package.replace("_", "-"): f"{package}.cli:main"}},
    )
