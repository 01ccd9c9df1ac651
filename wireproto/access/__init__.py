"""Who may do what: principals, access rules and the policy that checks them, sans-IO.

A connection's transport establishes a `Principal` (a name, roles, the protocol's client id, and
perhaps the topic patterns its token narrows it to). `AccessRule`s grant patterns per action
(`publish`, `subscribe`, `call`, `serve`) to a principal, a role, or everyone, with `%u` standing
for the principal's name and `%c` for its client id. `Policy.grants(principal)` gives the
connection's `Grants`, whose `allows` answers the same way whichever protocol asks: with rules,
what no rule allows is denied, and `Policy.open()` (no authentication configured) allows
everything. `tokens` (JWT) and `passwords` (the password file) turn credentials into principals;
`credentials` says what proved one, and until when.
"""

from __future__ import annotations

from .credentials import Credential
from .policy import ANONYMOUS, AccessRule, Action, Grants, Policy, Principal

__all__ = ["ANONYMOUS", "AccessRule", "Action", "Credential", "Grants", "Policy", "Principal"]
