"""`python -m eagle3_capture`: the `eagle3-capture` command line (cli.main)."""
import sys

from .cli import main

sys.exit(main())
