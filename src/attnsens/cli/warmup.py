"""``attnsens warmup``: compile every numba kernel once, so that no later command waits for it."""

from __future__ import annotations

from attnsens.cli.app import JsonOption, app, console, domain_errors_exit, error_console, print_json


@app.command()
@domain_errors_exit
def warmup(as_json: JsonOption = False) -> None:
    """Compile every kernel for this machine (once per version of attnsens; `make setup` runs it), one line each."""
    import time

    from attnsens._numba_cache import kernel_cache_dir
    from attnsens.warmup import warm_up

    def on_start(index: int, count: int, name: str) -> None:
        error_console.print(f"[{index}/{count}] {name} …", soft_wrap=True)

    start = time.perf_counter()
    stages = warm_up(on_start=on_start)
    seconds = time.perf_counter() - start
    compiled = [stage for stage in stages if stage.compiled]
    if as_json:
        print_json({
            "stages": [vars(stage) for stage in stages], "seconds": seconds, "cache": str(kernel_cache_dir()),
        })  # fmt: skip
        return
    for stage in stages:
        how = "compiled" if stage.compiled else "loaded from the cache"
        console.print(f"{stage.name}: {how} in {stage.seconds:.1f} s", soft_wrap=True)
    if not stages:
        console.print("numba is not installed: attnsens runs its torch code paths, with nothing to compile")
        return
    console.print(
        f"kernels ready in {seconds:.1f} s ({len(compiled)} of {len(stages)} stages compiled), cached in "
        f"{kernel_cache_dir()}",
        soft_wrap=True,
    )
