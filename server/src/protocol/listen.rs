//! Where a side listener (the ops port, the console) listens: an address, or `off`.

use std::net::SocketAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Off,
    At(SocketAddr),
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" | "" => Ok(Self::Off),
            addr => addr
                .parse()
                .map(Self::At)
                .map_err(|_| format!("{addr:?} is not an address like 127.0.0.1:7448 (or off)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_or_are_refused_with_the_expected_shape() {
        assert_eq!("off".parse::<Listen>(), Ok(Listen::Off));
        assert_eq!("0.0.0.0:9000".parse::<Listen>(), Ok(Listen::At("0.0.0.0:9000".parse().unwrap())));
        assert_eq!("[::1]:7448".parse::<Listen>(), Ok(Listen::At("[::1]:7448".parse().unwrap())));
        let refused = "localhost".parse::<Listen>().unwrap_err();
        assert!(refused.contains("127.0.0.1:7448"), "{refused}");
    }
}
