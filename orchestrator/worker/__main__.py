import sys

from orchestrator.worker.main import main

sys.exit(main())
