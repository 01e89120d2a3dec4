"""python -m qnccl: the same CLI as the `qnccl` command."""
import sys

from .cli import main

sys.exit(main())
