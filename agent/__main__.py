"""`python -m agent` runs the command-line interface."""

from agent.cli.main import main

if __name__ == "__main__":
    main()
