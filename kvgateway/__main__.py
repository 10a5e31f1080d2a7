from kvgateway.cli import main

raise SystemExit(main())
