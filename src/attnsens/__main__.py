"""``python -m attnsens``: the same command line as ``attnsens``."""

from attnsens.cli import main

main()
