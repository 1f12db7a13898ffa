"""`python -m offloadctl`: the same command line as the `offloadctl` script."""

from offloadctl._entry import main

main()
