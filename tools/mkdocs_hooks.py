"""mkdocs hooks of the documentation site (mkdocs.yml ``hooks``).

Underscores are never emphasis: the documents write subscripts in running text (‖A‖_{∞→1}, W_Q^h), which
Markdown's underscore emphasis would turn into italics; emphasis is written with asterisks.

MathJax is served from the site itself, never from a CDN: the ``django-static-mathjax`` package of the ``docs``
extra ships MathJax 3.2.2, and its single-file SVG build (which needs no font files) is copied into the site.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from markdown import Extension, Markdown

MATHJAX_SCRIPT = "assets/mathjax/tex-svg.js"


def _mathjax_source() -> Path:
    import mathjax  # django-static-mathjax: static files only, no Python code is run

    return Path(mathjax.__file__).parent / "static" / "mathjax" / "es5" / "tex-svg.js"


class _NoUnderscoreEmphasis(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        if md.delimiters is not None:
            md.delimiters.remove("_")


def on_config(config: Any) -> Any:
    config["markdown_extensions"].append(_NoUnderscoreEmphasis())
    return config


def on_post_build(config: Any, **_: Any) -> None:
    target = Path(config["site_dir"]) / MATHJAX_SCRIPT
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_mathjax_source(), target)
