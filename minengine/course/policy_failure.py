"""The one error lab 2's machinery raises about a policy: what rule it broke, or why a run could not finish.

Its own module because both sides of a graded run raise it: ``policy_harness``, which runs the policy
in this process, and ``policy_bridge``, which calls it in the student's kernel.
"""

from __future__ import annotations


class PolicyFailure(AssertionError):
    """The policy broke a rule or could not finish a run; the message says what and where."""
