import sys

from gpubox.cli import main

sys.exit(main())
