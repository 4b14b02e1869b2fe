// The push codecs pslab knows: cluster.codec -> codec. Adding one: its file beside these (a
// wire id of its own), a line here, its tests (tests/ps/test_codecs.cpp) and a line in docs/algorithms.md.
#include "ps/codecs/codec.h"

namespace pslab {

std::unique_ptr<PushCodec> make_f32(const std::string&);
std::unique_ptr<PushCodec> make_f16(const std::string&);
std::unique_ptr<PushCodec> make_bf16(const std::string&);
std::unique_ptr<PushCodec> make_int8(const std::string&);
std::unique_ptr<PushCodec> make_topk(const std::string&);
std::unique_ptr<PushCodec> make_sign(const std::string&);

Registry<PushCodec>& codec_registry() {
  static Registry<PushCodec> r("push codec", {
      {"f32", "f32", "dense float32, sent and applied in place", false, make_f32},
      {"f16", "f16", "IEEE half precision: half the bytes, relative error <= 2^-11, |g| saturated at 65504", false, make_f16},
      {"bf16", "bf16", "bfloat16: half the bytes, float32's range, relative error <= 2^-8", false, make_bf16},
      {"int8", "int8", "a scale and a byte per entry: a quarter of the bytes, error <= max|g| / 254", false, make_int8},
      {"topk", "topk:<f>", "the fraction f of entries largest in magnitude, as (index, value) pairs", true, make_topk},
      {"sign", "sign", "a bit per entry and the mean |g|: 1/32 of the bytes", false, make_sign},
  });
  return r;
}

}  // namespace pslab
