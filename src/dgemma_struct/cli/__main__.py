"""``python -m dgemma_struct.cli``: the dgemma-struct command."""
import sys

from dgemma_struct.cli import main

if __name__ == "__main__":
    sys.exit(main())
