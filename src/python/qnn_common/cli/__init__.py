"""What every CLI shares: logging, exit codes, third-party noise, child processes' env."""
