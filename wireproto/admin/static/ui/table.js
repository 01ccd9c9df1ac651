// Tables updated in place: a row is kept by its key from one update to the next, a cell whose
// text has not changed is not touched, and a row moves only when the order asks it to. So what a
// reader selects in a table (a peer's address, a topic) stays selected while the page updates.
//
// A LiveTable adds what a long list needs, asked of the API rather than done here: a filter box,
// a sort by any column whose header names a field (data-sort), and a page at a time.

import { clipped, element, integer } from "./format.js";

const FILTER_DELAY_MS = 300;
// A filter goes into the status poll's URL, percent-encoded (up to 9 characters for one), both
// tables' in one: longer than this, the request would pass the 16 KiB the broker reads of a
// request's line and headers, and every poll would fail until the filter is cleared.
const FILTER_MAX_CHARACTERS = 500;

function setText(cell, text, title) {
  if (cell.firstChild && cell.firstChild === cell.lastChild && cell.firstChild.nodeType === 3) {
    // Changing the text node's data, not replacing the node, keeps a selection elsewhere.
    cell.firstChild.data = text;
  } else {
    cell.textContent = text;
  }
  if (title) cell.title = title;
  else cell.removeAttribute("title");
}

export class RowsInPlace {
  // `cells(item)`: the row's texts, one a column; `extra(item, row)`: called once when a row
  // is made, to add what does not change (a button).
  constructor(table, { key, cells, extra }) {
    this.table = table;
    this.key = key;
    this.cells = cells;
    this.extra = extra;
    this.rows = new Map(); // key -> {row, texts}
    // Each column's classes, from its header: what hides or wraps on a narrow screen.
    this.classes = [...table.tHead.rows[0].cells].map((header) => header.className);
  }

  show(items) {
    const body = this.table.tBodies[0];
    const keys = items.map(this.key);
    const wanted = new Set(keys);
    for (const [key, kept] of this.rows) {
      if (!wanted.has(key)) {
        kept.row.remove();
        this.rows.delete(key);
      }
    }
    items.forEach((item, index) => {
      const texts = this.cells(item);
      let kept = this.rows.get(keys[index]);
      if (kept === undefined) {
        kept = this.make(item, texts.length);
        this.rows.set(keys[index], kept);
      }
      this.update(kept, texts);
      const there = body.children[index];
      if (there !== kept.row) body.insertBefore(kept.row, there ?? null);
    });
  }

  make(item, count) {
    const row = element("tr");
    for (let index = 0; index < count; index += 1) {
      row.append(element("td", null, this.classes[index] || ""));
    }
    if (this.extra) this.extra(item, row);
    return { row, texts: new Array(count).fill(null) };
  }

  update(kept, texts) {
    texts.forEach((value, index) => {
      const text = value === undefined || value === null ? "" : String(value);
      if (kept.texts[index] === text) return;
      kept.texts[index] = text;
      const shown = clipped(text);
      setText(kept.row.cells[index], shown.text, shown.title);
    });
  }
}

export class LiveTable extends RowsInPlace {
  // `name`: the table's id, and the prefix of its controls' (NAME-filter, NAME-prev, NAME-next,
  // NAME-rows, NAME-count, NAME-empty); `changed()`: called when what to ask for changes.
  constructor(name, { limit, sort, empty, changed, ...rows }) {
    super(document.getElementById(name), rows);
    this.name = name;
    this.limit = limit;
    this.offset = 0;
    this.q = "";
    this.sort = sort;
    this.matched = 0;
    this.emptyText = empty;
    this.changed = changed;
    this.control("filter").maxLength = FILTER_MAX_CHARACTERS;
    this.control("filter").addEventListener("input", (event) => this.filtered(event.target.value));
    this.control("prev").addEventListener("click", () => this.moveTo(this.offset - this.limit));
    this.control("next").addEventListener("click", () => this.moveTo(this.offset + this.limit));
    for (const header of this.table.tHead.querySelectorAll("th[data-sort]")) {
      const button = element("button", header.textContent, "sort");
      button.type = "button";
      button.append(element("span", "", "arrow"));
      button.lastChild.setAttribute("aria-hidden", "true");
      header.replaceChildren(button);
      button.addEventListener("click", () => this.sortBy(header.dataset.sort));
    }
    this.showSort();
  }

  control(part) {
    return document.getElementById(`${this.name}-${part}`);
  }

  // The API's parameters for this table: offset, q, sort, limit.
  parameters() {
    const found = { offset: this.offset, sort: this.sort, limit: this.limit };
    if (this.q) found.q = this.q;
    return found;
  }

  filtered(text) {
    clearTimeout(this.filterTimer);
    this.filterTimer = setTimeout(() => {
      const q = text.trim().slice(0, FILTER_MAX_CHARACTERS);
      if (q === this.q) return;
      this.q = q;
      this.offset = 0;
      this.changed();
    }, FILTER_DELAY_MS);
  }

  moveTo(offset) {
    const next = Math.max(0, offset);
    if (next === this.offset || next >= Math.max(this.matched, 1)) return;
    this.offset = next;
    this.changed();
  }

  sortBy(field) {
    this.sort = this.sort === field ? `-${field}` : field;
    this.offset = 0;
    this.showSort();
    this.changed();
  }

  showSort() {
    const field = this.sort.replace(/^-/, "");
    const descending = this.sort.startsWith("-");
    for (const header of this.table.tHead.querySelectorAll("th[data-sort]")) {
      const arrow = header.querySelector(".arrow");
      if (header.dataset.sort === field) {
        header.setAttribute("aria-sort", descending ? "descending" : "ascending");
        arrow.textContent = descending ? " ▼" : " ▲";
      } else {
        header.removeAttribute("aria-sort");
        arrow.textContent = "";
      }
    }
  }

  // `items` and the API's counts for them ({total, matched, offset, limit}); without counts
  // (an API that does not page) the items are all there is. Answers whether the offset had to
  // move back (the rows it showed are gone), when the page should ask again.
  showPage(items, page) {
    const counts = page ?? { total: items.length, matched: items.length, offset: 0,
                             limit: Math.max(items.length, 1) };
    this.matched = counts.matched;
    if (page && this.offset > 0 && this.offset >= counts.matched) {
      this.offset = Math.max(0, Math.floor((counts.matched - 1) / this.limit) * this.limit);
      return true;
    }
    this.show(items);
    const first = counts.offset + 1;
    const last = counts.offset + items.length;
    this.control("count").textContent = `(${integer(counts.matched)} of ${integer(counts.total)})`;
    this.control("rows").textContent = items.length
      ? `rows ${integer(first)}-${integer(last)}` : "no rows";
    this.control("prev").disabled = counts.offset <= 0;
    this.control("next").disabled = last >= counts.matched;
    const empty = this.control("empty");
    empty.hidden = items.length > 0;
    empty.textContent = this.q ? `nothing matches “${this.q}”` : this.emptyText;
    return false;
  }
}
