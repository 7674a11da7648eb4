"""``attnsens version``: the package version and where it was installed from."""

from __future__ import annotations

from attnsens.cli.app import JsonOption, app, console, print_json


@app.command()
def version(as_json: JsonOption = False) -> None:
    """Print the attnsens version and git revision."""
    import attnsens
    from attnsens.provenance import git_sha

    info = {"attnsens": attnsens.__version__, "git_sha": git_sha()}
    if as_json:
        print_json(info)
    else:
        console.print(f"attnsens {info['attnsens']} ({info['git_sha'] or 'no git revision'})")
