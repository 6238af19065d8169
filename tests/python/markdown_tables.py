"""Reading back the markdown tables that the benchmark scripts print."""


def parse_tables(text):
    """Each markdown table of text as (header, rows of cells)."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if current is None:
                current = (cells, [])
                tables.append(current)
            elif not all(set(cell) <= {"-"} for cell in cells):
                current[1].append(cells)
        else:
            current = None
    return tables
