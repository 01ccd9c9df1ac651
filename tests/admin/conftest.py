# The access tests' broker credentials: an HS256 secret, a password file and tokens.
from tests.access.conftest import auth_files  # noqa: F401
