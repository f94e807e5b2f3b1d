"""What the script tests share: the repository root (their first argument, else two folders up) and
checks that print each failure as it happens and end the test with a non-zero status if any failed.

    from script_checks import Checks, repo_root
    checks = Checks()
    checks("what must hold", ok)
    checks.finish("summary printed when every check passed")
"""
import os
import sys


def repo_root():
    return sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, what, ok):
        if not ok:
            self.failures.append(what)
            print("FAIL:", what)

    def finish(self, passed_message):
        if self.failures:
            sys.exit(f"{len(self.failures)} check(s) failed")
        print(passed_message)
