//! From buffer lengths to a call's element count, the same rule for every
//! backend: `count` is elements per block, as in `ferrocoll_core`'s
//! [`CallShape`](ferrocoll_core::plan::CallShape).

use ferrocoll_core::Collective;

use crate::ArgumentError;

/// The elements per block of `collective` on `n` ranks with an output
/// (or, in place, the one buffer) of `output` elements and, out of place,
/// an input of `input` elements. In place the buffer holds
/// [`Collective::size_blocks`] blocks; out of place each buffer its own
/// number of blocks.
pub fn block_count(
    collective: Collective,
    n: u32,
    input: Option<usize>,
    output: usize,
) -> Result<usize, ArgumentError> {
    let name = collective.to_string();
    let blocks = |b: u32| b as usize;
    if collective == Collective::SendRecv {
        return Err(ArgumentError::Unsupported(
            "point-to-point is not a collective of the device API".into(),
        ));
    }
    let Some(input) = input else {
        if collective == Collective::AllToAll {
            return Err(ArgumentError::Unsupported(
                "all-to-all has no in-place form".into(),
            ));
        }
        let per = blocks(collective.size_blocks(n));
        return whole(&name, "buffer", output, per);
    };
    let count = whole(&name, "output", output, blocks(collective.output_blocks(n)))?;
    let want = count * blocks(collective.input_blocks(n));
    if input != want {
        return Err(ArgumentError::Length {
            collective: name,
            buffer: "input",
            len: input,
            want: format!("the output's length asks for {want}"),
        });
    }
    Ok(count)
}

/// `len / per`, or the error when `len` is not whole blocks.
fn whole(
    collective: &str,
    buffer: &'static str,
    len: usize,
    per: usize,
) -> Result<usize, ArgumentError> {
    if len % per != 0 {
        return Err(ArgumentError::Length {
            collective: collective.to_owned(),
            buffer,
            len,
            want: format!("a multiple of {per} (one block per rank)"),
        });
    }
    Ok(len / per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_each_collectives_blocks() {
        let n = 4;
        assert_eq!(block_count(Collective::AllReduce, n, Some(10), 10), Ok(10));
        assert_eq!(block_count(Collective::AllReduce, n, None, 7), Ok(7));
        assert_eq!(block_count(Collective::AllGather, n, Some(3), 12), Ok(3));
        assert_eq!(block_count(Collective::AllGather, n, None, 12), Ok(3));
        assert_eq!(
            block_count(Collective::ReduceScatter, n, Some(12), 3),
            Ok(3)
        );
        assert_eq!(block_count(Collective::ReduceScatter, n, None, 12), Ok(3));
        assert_eq!(block_count(Collective::AllToAll, n, Some(8), 8), Ok(2));
        let root = Collective::Broadcast { root: 1 };
        assert_eq!(block_count(root, n, Some(5), 5), Ok(5));
        assert_eq!(block_count(Collective::AllReduce, n, Some(0), 0), Ok(0));
    }

    #[test]
    fn lengths_that_do_not_fit_are_refused() {
        let n = 4;
        let e = block_count(Collective::AllReduce, n, Some(9), 10).unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::Length {
                    buffer: "input",
                    len: 9,
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
                    buffer: "buffer",
                    ..
                }
            ),
            "{e}"
        );
        let e = block_count(Collective::ReduceScatter, n, Some(13), 3).unwrap_err();
        assert!(e.to_string().contains("asks for 12"), "{e}");
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
