import sys

from edgeserve.cli import main

sys.exit(main())
