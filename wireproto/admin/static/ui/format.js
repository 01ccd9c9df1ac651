// How the page writes what the broker says: numbers in the reader's locale, durations, clock
// times, payloads. Text from the broker only ever goes into the page as text.

const integers = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const rates = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

// A cell shows at most this many characters of a broker's text; the rest is in its title.
export const SHOWN_CHARACTERS = 300;

export function element(tag, text, className) {
  const made = document.createElement(tag);
  if (text !== undefined && text !== null) made.textContent = String(text);
  if (className) made.className = className;
  return made;
}

// 1234567 -> "1,234,567" (in the reader's locale); anything not a number -> "".
export function integer(value) {
  return typeof value === "number" && Number.isFinite(value) ? integers.format(value) : "";
}

// 2.345 -> "2.3": a rate has at most one decimal.
export function rate(value) {
  return typeof value === "number" && Number.isFinite(value) ? rates.format(value) : "";
}

// Seconds as the two largest units: "42 s", "3 min 5 s", "2 h 5 min", "3 d 4 h".
export function duration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "";
  const whole = Math.max(0, Math.floor(seconds));
  const units = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];
  for (let index = 0; index < units.length - 1; index += 1) {
    const [name, size] = units[index];
    if (whole >= size) {
      const [next, nextSize] = units[index + 1];
      return `${Math.floor(whole / size)} ${name} ${Math.floor((whole % size) / nextSize)} ${next}`;
    }
  }
  return `${whole} s`;
}

const two = (number) => String(number).padStart(2, "0");

// Unix seconds -> "HH:MM:SS.mmm", local time.
export function clock(seconds) {
  const when = new Date(seconds * 1000);
  return `${two(when.getHours())}:${two(when.getMinutes())}:${two(when.getSeconds())}.` +
    String(when.getMilliseconds()).padStart(3, "0");
}

// A broker's text as a cell shows it: at most SHOWN_CHARACTERS, and the whole in a title when
// it is cut.
export function clipped(text) {
  const whole = text === undefined || text === null ? "" : String(text);
  if (whole.length <= SHOWN_CHARACTERS) return { text: whole, title: "" };
  return { text: `${whole.slice(0, SHOWN_CHARACTERS)}…`, title: whole.slice(0, 16384) };
}

// A payload described by the API (a tap line, a last value) as [label, text]: the text as sent
// when the API gives it, hex for bytes, else the decoded JSON or msgpack value.
export function payloadText(described) {
  const cut = described.truncated ? " …" : "";
  if ("text" in described) return ["", described.text + cut];
  if ("hex" in described) return ["hex", described.hex + cut];
  for (const kind of ["json", "msgpack"]) {
    if (kind in described) return [kind, JSON.stringify(described[kind]) + cut];
  }
  return ["", ""];
}
