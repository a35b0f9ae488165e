"""`python -m sk.export ...`, the same as `sk export ...`."""
import sys

from sk.export import main

sys.exit(main())
