//! What a layer can be set to ([`OtlpLayerBuilder`](super::OtlpLayerBuilder)
//! takes them): the level of detail, what a phase span groups by, the
//! transport, who exports host spans.

use std::str::FromStr;

/// How much of each launch becomes spans. See the [module docs](crate::otlp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Detail {
    /// One span per launch, with summary attributes.
    Kernel,
    /// One span per event type and warp role (or block), aggregated. The default.
    #[default]
    Phase,
    /// Every event, under one span per (block, warp).
    Warp,
}

/// What one [`Detail::Phase`] span aggregates over, besides the event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PhaseGroup {
    /// The warp index within the block, across all blocks: in a warp-specialized
    /// kernel, the warp's role (producer, consumer...). The default.
    #[default]
    WarpRole,
    /// The block.
    Block,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// OTLP/gRPC (default port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (default port 4318); the
    /// specification's default.
    HttpProtobuf,
}

impl FromStr for Protocol {
    type Err = String;

    /// Parses the values of `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or `http/protobuf`.
    fn from_str(s: &str) -> Result<Protocol, String> {
        match s.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => Err("http/json is not supported; use grpc or http/protobuf".into()),
            other => Err(format!(
                "unknown OTLP protocol {other:?}; expected grpc or http/protobuf"
            )),
        }
    }
}

/// Who exports the host spans. See the [module docs](crate::otlp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HostSpans {
    /// This layer exports them unless a `tracing_opentelemetry` layer in the
    /// same subscriber does. The default.
    #[default]
    Auto,
    /// This layer always exports them.
    Export,
    /// This layer never exports them (only device spans).
    Skip,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_as_the_standard_variable_spells_them() {
        assert_eq!("grpc".parse(), Ok(Protocol::Grpc));
        assert_eq!(" http/protobuf".parse(), Ok(Protocol::HttpProtobuf));
        assert!("http/json"
            .parse::<Protocol>()
            .unwrap_err()
            .contains("not supported"));
        assert!("udp".parse::<Protocol>().is_err());
    }
}
