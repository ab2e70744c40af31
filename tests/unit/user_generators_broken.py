"""A generator module whose own code fails on import (for the tests)."""

BROKEN = 1 / 0
