//! From buffer lengths to a call's element count: core's one rule
//! ([`ferrocoll_core::types::block_count`], which the host API applies
//! too), with the device API's own refusals and errors.

use ferrocoll_core::Collective;
use ferrocoll_core::types::ShapeError;

use crate::ArgumentError;

/// The elements per block of `collective` on `n` ranks with an output
/// (or, in place, the one buffer) of `output` elements and, out of place,
/// an input of `input` elements: core's rule, where the buffer of fewer
/// blocks sets the count. Point-to-point is not a call of the device API.
pub fn block_count(
    collective: Collective,
    n: u32,
    input: Option<usize>,
    output: usize,
) -> Result<usize, ArgumentError> {
    if collective == Collective::SendRecv {
        return Err(ArgumentError::Unsupported(
            "point-to-point is not a collective of the device API".into(),
        ));
    }
    ferrocoll_core::types::block_count(collective, n, input, output).map_err(|e| match e {
        ShapeError::Length {
            buffer,
            len,
            needed,
        } => ArgumentError::Length {
            collective: collective.to_string(),
            buffer,
            len,
            want: format!("the call needs {needed}"),
        },
        ShapeError::NoInPlace(_) => ArgumentError::Unsupported(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_cores() {
        // The rule itself is tested with core's `block_count`; here, that
        // the device API applies it.
        assert_eq!(block_count(Collective::AllGather, 4, Some(3), 12), Ok(3));
        assert_eq!(block_count(Collective::ReduceScatter, 4, None, 12), Ok(3));
    }

    #[test]
    fn lengths_that_do_not_fit_are_refused() {
        let n = 4;
        let e = block_count(Collective::AllReduce, n, Some(9), 10).unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::Length {
                    buffer: "output",
                    len: 10,
                    ..
                }
            ),
            "{e}"
        );
        let e = block_count(Collective::AllGather, n, Some(3), 13).unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::Length {
                    buffer: "output",
                    len: 13,
                    ..
                }
            ),
            "{e}"
        );
        let e = block_count(Collective::ReduceScatter, n, None, 10).unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::Length {
                    buffer: "in-place buffer",
                    ..
                }
            ),
            "{e}"
        );
        let e = block_count(Collective::ReduceScatter, n, Some(13), 3).unwrap_err();
        assert!(e.to_string().contains("the call needs 12"), "{e}");
    }

    #[test]
    fn forms_the_device_api_does_not_offer_are_refused() {
        assert!(matches!(
            block_count(Collective::AllToAll, 2, None, 8),
            Err(ArgumentError::Unsupported(_))
        ));
        assert!(matches!(
            block_count(Collective::SendRecv, 2, Some(1), 1),
            Err(ArgumentError::Unsupported(_))
        ));
    }
}
