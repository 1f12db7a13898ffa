"""`python -m offloadctl` runs the command line."""

from offloadctl.cli import main

main()
