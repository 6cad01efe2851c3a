//! An OpenAI-compatible embeddings client: `POST {base}/v1/embeddings` with
//! `{"model", "input": [texts]}`, answered by `{"data": [{"index",
//! "embedding"}]}`. OpenAI, Ollama, vLLM and TEI speak this protocol.
//!
//! It is blocking on purpose: the processor runs on the engine thread, not in
//! an async runtime, and a batch must be embedded before its rows are emitted.

use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::Embedder;

/// A client of one endpoint and model.
#[derive(Debug, Clone)]
pub struct OpenAiEmbedder {
    client: reqwest::blocking::Client,
    url: String,
    model: String,
    api_key: Option<String>,
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    input: &'a [String],
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    /// A client of `{base_url}/v1/embeddings`, with `api_key` as bearer token
    /// if given; one request may take at most `timeout`.
    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .build()
            .context("cannot build the embedder's HTTP client")?;
        Ok(OpenAiEmbedder {
            client,
            url: format!("{}/v1/embeddings", base_url.trim_end_matches('/')),
            model: model.to_string(),
            api_key: api_key.filter(|key| !key.is_empty()).map(str::to_string),
        })
    }
}

/// The vectors of `data` in input order (the protocol allows any order and
/// says which input each answers by `index`); `count` inputs were sent.
fn in_input_order(mut data: Vec<Item>, count: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    data.sort_by_key(|item| item.index);
    let indexes_match = data.len() == count && data.iter().enumerate().all(|(i, d)| d.index == i);
    anyhow::ensure!(
        indexes_match,
        "the answer does not hold exactly one embedding per input ({count} inputs)"
    );
    Ok(data.into_iter().map(|item| item.embedding).collect())
}

impl Embedder for OpenAiEmbedder {
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut request = self.client.post(&self.url).json(&Request {
            model: &self.model,
            input: texts,
        });
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .with_context(|| format!("POST {}", self.url))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            anyhow::bail!("POST {} answered {status}: {body}", self.url);
        }
        let answer: Response = response
            .json()
            .with_context(|| format!("POST {}: not an embeddings answer", self.url))?;
        in_input_order(answer.data, texts.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(index: usize, value: f32) -> Item {
        Item {
            index,
            embedding: vec![value],
        }
    }

    #[test]
    fn answers_are_put_in_input_order_by_index() {
        let data = vec![item(2, 2.0), item(0, 0.0), item(1, 1.0)];
        assert_eq!(
            in_input_order(data, 3).unwrap(),
            vec![vec![0.0], vec![1.0], vec![2.0]]
        );
    }

    #[test]
    fn missing_or_duplicate_indexes_are_errors() {
        assert!(in_input_order(vec![item(0, 0.0)], 2).is_err());
        assert!(in_input_order(vec![item(0, 0.0), item(0, 1.0)], 2).is_err());
        assert!(in_input_order(vec![item(1, 0.0)], 1).is_err());
    }

    #[test]
    fn the_request_is_openai_shaped() {
        let input = vec!["a".to_string(), "b".to_string()];
        let body = serde_json::to_value(Request {
            model: "m",
            input: &input,
        })
        .unwrap();
        assert_eq!(body, serde_json::json!({"model": "m", "input": ["a", "b"]}));
        let embedder =
            OpenAiEmbedder::new("http://host:1/", "m", Some(""), Duration::from_secs(1)).unwrap();
        assert_eq!(embedder.url, "http://host:1/v1/embeddings");
        assert_eq!(embedder.api_key, None);
    }
}
