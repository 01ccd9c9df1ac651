"""Steps on the status page for the browser tests. Each runs in the browser's thread
(`Browser.run(step, page, ...)`), as Playwright's sync API must."""

from __future__ import annotations

from typing import Any

from tests.access.conftest import AuthFiles
from tests.admin.http import start
from tests.brokers import LOCAL, Broker
from tests.browser.conftest import Browser
from wireproto.authentication import AuthSettings

# The page polls every second and a tap is a stream: what a client does shows within a second,
# given here with room for a busy machine.
SHOWN_WITHIN_MS = 3000


async def open_page(browser: Browser, base: str, **context: Any) -> Any:
    page = await browser.page(**context)
    await browser.run(page.goto, base + "/")
    return page


async def open_page_behind_auth(broker: Broker, browser: Browser,
                                auth_files: AuthFiles) -> tuple[Any, Any]:
    """A broker with [auth] (the access tests' passwords and JWT secret) and the page opened
    on it: the service and the page."""
    auth = AuthSettings(enabled=True, jwt_algorithms=("HS256",),
                        jwt_secret_file=str(auth_files.secret),
                        password_file=str(auth_files.passwords))
    service, _, base = await start(broker, f"websmq+ws@tcp:0:{LOCAL}", auth=auth)
    return service, await open_page(browser, base)


def broker_shown(page: Any) -> None:
    page.wait_for_selector("#broker:not([hidden])")


def row_with(page: Any, table: str, text: str) -> str:
    row = page.locator(f"#{table} tbody tr", has_text=text).first
    row.wait_for(timeout=SHOWN_WITHIN_MS)
    return row.inner_text()


def rows(page: Any, table: str) -> list[list[str]]:
    """The table's rows, as the texts of their cells."""
    return page.eval_on_selector_all(
        f"#{table} tbody tr",
        "rows => rows.map(row => [...row.cells].map(cell => cell.textContent))")


def updates(page: Any) -> int:
    """How many updates the page has drawn (its `wireproto-update` measures)."""
    return page.evaluate("() => performance.getEntriesByName('wireproto-update').length")


def wait_updates(page: Any, count: int = 2) -> None:
    """Until the page has drawn `count` more updates."""
    target = updates(page) + count
    page.wait_for_function(
        f"() => performance.getEntriesByName('wireproto-update').length >= {target}",
        timeout=SHOWN_WITHIN_MS * count)


def wait_text(page: Any, selector: str, text: str) -> str:
    """Until the element's text holds `text`; its text."""
    page.wait_for_function(
        "([selector, text]) => document.querySelector(selector)?.textContent.includes(text)",
        arg=[selector, text], timeout=SHOWN_WITHIN_MS)
    return page.text_content(selector)


def tap(page: Any, pattern: str) -> None:
    page.fill("#tap [name=pattern]", pattern)
    page.click("#tap button[type=submit]")
    page.wait_for_function(
        "pattern => document.querySelector('#tap-state').textContent === `tapping ${pattern}`",
        arg=pattern)


def tapped_line(page: Any, text: str) -> str:
    line = page.locator("#tapped li", has_text=text).first
    line.wait_for(timeout=SHOWN_WITHIN_MS)
    return line.inner_text()


def overflow(page: Any) -> int:
    """How far the page is wider than its window (0 or less: no sideways scroll)."""
    return page.evaluate("() => document.documentElement.scrollWidth - innerWidth")


def submit(page: Any, form: str, fields: dict[str, str]) -> str:
    """Fills the form's fields and submits it; what its output then says."""
    for name, value in fields.items():
        if page.locator(f"#{form} select[name={name}]").count():
            page.select_option(f"#{form} [name={name}]", value)
        else:
            page.fill(f"#{form} [name={name}]", value)
    page.evaluate(f"() => {{ document.querySelector('#{form} output').value = ''; }}")
    page.click(f"#{form} button[type=submit]")
    page.wait_for_function(f"() => document.querySelector('#{form} output').value !== ''")
    return page.eval_on_selector(f"#{form} output", "output => output.value")


# How many pixels of a chart's canvas are in one of the page's colours (a CSS variable such as
# "--in"), within a box given in fractions of its size: rows from `top` to `bottom` (0: the top),
# columns from `left`.
CHART_PIXELS = """([id, colour, top = 0, bottom = 1, left = 0]) => {
  const canvas = document.getElementById(id);
  const wanted = getComputedStyle(document.documentElement).getPropertyValue(colour).trim();
  const [r, g, b] = [1, 3, 5].map(at => parseInt(wanted.slice(at, at + 2), 16));
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let found = 0;
  for (let at = 0; at < data.length; at += 4) {
    const near = Math.abs(data[at] - r) + Math.abs(data[at + 1] - g) + Math.abs(data[at + 2] - b);
    const row = Math.floor(at / 4 / canvas.width);
    const column = (at / 4) % canvas.width;
    if (data[at + 3] > 100 && near < 40 && row >= top * canvas.height
        && row < bottom * canvas.height && column >= left * canvas.width) found += 1;
  }
  return found;
}"""
