import sys

from tests.benchmarks.suite import main

sys.exit(main())
