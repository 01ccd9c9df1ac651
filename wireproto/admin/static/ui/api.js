// The admin API at /api/ as the page calls it: the credentials of the login form (kept for this
// tab only) in an Authorization header, and the header that tells the broker a 401 is for the
// page's own form rather than the browser's dialog.

const CREDENTIALS = "wireproto-authorization";

export function credentials() {
  return sessionStorage.getItem(CREDENTIALS);
}

export function setCredentials(authorization) {
  if (authorization) sessionStorage.setItem(CREDENTIALS, authorization);
  else sessionStorage.removeItem(CREDENTIALS);
}

export function headers(extra = {}) {
  const found = { "x-wireproto-page": "1", ...extra };
  const authorization = credentials();
  if (authorization) found.authorization = authorization;
  return found;
}

export class Refused extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// GET /api/PATH, or POST `body` as JSON; the answer's JSON, or a Refused with the API's error.
export async function api(path, body) {
  const options = body === undefined
    ? { headers: headers() }
    : { method: "POST", headers: headers({ "content-type": "application/json" }),
        body: JSON.stringify(body) };
  const response = await fetch(`/api/${path}`, options);
  const answer = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Refused(response.status, answer.error || response.statusText);
  return answer;
}
