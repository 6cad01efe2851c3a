//! Building a [`TestDriver`]: its options, and every stage of the pipeline
//! over in-memory topics, a manual clock and a temporary state directory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::{DriverEnv, MemoryTopic, TempDir, TestDriver, START_EPOCH_MS};
use crate::app::Pipeline;
use crate::avro::Registry;
use crate::clock::Clock;

/// Options of a [`TestDriver`] beyond what the pipeline's flags say.
pub struct TestDriverBuilder {
    pipeline: Pipeline,
    default_partitions: usize,
    partitions: HashMap<String, usize>,
}

impl TestDriverBuilder {
    /// Gives every input topic not named in [`topic_partitions`](Self::topic_partitions)
    /// `count` partitions (default 1).
    pub fn partitions(mut self, count: usize) -> Self {
        self.default_partitions = count;
        self
    }

    /// Gives input topic `topic` `count` partitions.
    pub fn topic_partitions(mut self, topic: &str, count: usize) -> Self {
        self.partitions.insert(topic.to_string(), count);
        self
    }

    /// Builds every stage and opens all of their tasks.
    pub fn build(self) -> anyhow::Result<TestDriver> {
        static DRIVERS: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "streams-test-driver-{}-{}",
            std::process::id(),
            DRIVERS.fetch_add(1, Ordering::Relaxed)
        ));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let (clock, time) = Clock::manual(START_EPOCH_MS);
        let (args, service, specs) = self.pipeline.into_parts();
        let mut env = DriverEnv {
            application_id: args.application_id_or(service),
            registry: Registry::in_memory(),
            clock,
            shutdown: Arc::new(AtomicBool::new(false)),
            dir: dir.clone(),
            partitions: self.partitions,
            default_partitions: self.default_partitions,
            link_writers: HashMap::new(),
            inputs: HashMap::new(),
            args,
        };
        let mut stages = Vec::with_capacity(specs.len());
        for spec in specs {
            stages.push(spec.into_driver_stage(&mut env)?);
        }
        let topics = env
            .partitions
            .iter()
            .map(|(name, count)| {
                let topic = MemoryTopic {
                    partitions: vec![Vec::new(); *count],
                };
                (name.clone(), topic)
            })
            .collect();
        let cursors = stages.iter().map(|_| HashMap::new()).collect();
        let committed = stages.iter().map(|_| HashMap::new()).collect();
        Ok(TestDriver {
            stages,
            topics,
            registry: env.registry,
            inputs: env.inputs,
            time,
            dir: TempDir(dir),
            sequence: 0,
            cursors,
            committed,
        })
    }
}

impl TestDriver {
    /// A driver for `pipeline` with one partition per input topic.
    pub fn new(pipeline: Pipeline) -> anyhow::Result<TestDriver> {
        Self::builder(pipeline).build()
    }

    /// A driver for `pipeline`, with options.
    pub fn builder(pipeline: Pipeline) -> TestDriverBuilder {
        TestDriverBuilder {
            pipeline,
            default_partitions: 1,
            partitions: HashMap::new(),
        }
    }
}
