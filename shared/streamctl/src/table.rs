//! Aligned table output, like the Flink SQL client's query results.

use apache_avro::types::Value;

use streams_runtime::avro::json::write_value;

/// Renders records as a boxed table with one column per field (the key first).
pub fn render(rows: &[(Option<String>, Value)]) -> String {
    let mut header = vec!["key".to_string()];
    if let Some((_, Value::Record(fields))) = rows.first() {
        header.extend(fields.iter().map(|(name, _)| name.clone()));
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(key, value)| {
            let mut row = vec![key.clone().unwrap_or_else(|| "<null>".into())];
            if let Value::Record(fields) = value {
                row.extend(fields.iter().map(|(_, field)| cell(field)));
            }
            row
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            cells
                .iter()
                .filter_map(|row| row.get(column))
                .chain([&header[column]])
                .map(|text| text.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let rule: String = widths
        .iter()
        .map(|width| format!("+{}", "-".repeat(width + 2)))
        .collect::<String>()
        + "+\n";
    let line = |row: &[String]| -> String {
        row.iter()
            .zip(&widths)
            .map(|(text, width)| format!("| {text:<width$} "))
            .collect::<String>()
            + "|\n"
    };
    let mut out = rule.clone();
    out += &line(&header);
    out += &rule;
    for row in &cells {
        out += &line(row);
    }
    out += &rule;
    out += &format!(
        "{} row{} in set\n",
        cells.len(),
        if cells.len() == 1 { "" } else { "s" }
    );
    out
}

/// Arrays longer than this are shortened in a cell (`--format jsonl` shows
/// them whole), so that a row of embedding vectors stays one screen wide.
const LONGEST_ARRAY: usize = 6;
/// Items a shortened array shows.
const SHOWN_ITEMS: usize = 4;

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "<null>".into(),
        Value::Union(_, inner) => cell(inner),
        Value::String(text) | Value::Enum(_, text) => text.clone(),
        Value::Array(items) if items.len() > LONGEST_ARRAY => {
            let shown: Vec<String> = items[..SHOWN_ITEMS]
                .iter()
                .map(|item| match item {
                    Value::Float(x) => format!("{x:.4}"),
                    Value::Double(x) => format!("{x:.4}"),
                    other => cell(other),
                })
                .collect();
            format!("[{}, … {} items]", shown.join(", "), items.len())
        }
        other => {
            let mut out = String::new();
            write_value(&mut out, other);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let rows = vec![
            (
                Some("1".to_string()),
                Value::Record(vec![
                    ("customer".into(), Value::String("Art Vandelay".into())),
                    ("hr".into(), Value::Long(1)),
                ]),
            ),
            (
                Some("10".to_string()),
                Value::Record(vec![
                    ("customer".into(), Value::String("Bo".into())),
                    ("hr".into(), Value::Long(120)),
                ]),
            ),
        ];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[1], "| key | customer     | hr  |");
        assert_eq!(lines[3], "| 1   | Art Vandelay | 1   |");
        assert!(lines.iter().take(6).all(|l| l.len() == lines[0].len()));
        assert_eq!(lines.last().unwrap(), &"2 rows in set");
    }

    #[test]
    fn shortens_long_arrays() {
        let vector =
            |n: usize| Value::Array((0..n).map(|i| Value::Float(i as f32 / 3.0)).collect());
        let rows = vec![(
            None,
            Value::Record(vec![
                ("short".into(), vector(3)),
                ("embedding".into(), vector(384)),
            ]),
        )];
        let table = render(&rows);
        let cells: Vec<&str> = table.lines().nth(3).unwrap().split(" | ").collect();
        assert_eq!(cells[1], "[0.0, 0.3333333432674408, 0.6666666865348816]");
        assert_eq!(
            cells[2].trim_end_matches(" |"),
            "[0.0000, 0.3333, 0.6667, 1.0000, … 384 items]"
        );
    }
}
