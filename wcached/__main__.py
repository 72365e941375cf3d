import sys

from wcached.cli import main

sys.exit(main())
