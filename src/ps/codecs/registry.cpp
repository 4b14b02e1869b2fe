// The push codecs pslab knows: cluster.codec -> codec. Adding one: its file beside these (a
// wire id of its own), a line here, its tests (tests/test_codecs.cpp) and a README line.
#include "ps/codecs/codec.h"

namespace pslab {

std::unique_ptr<PushCodec> make_f32(const std::string&);
std::unique_ptr<PushCodec> make_f16(const std::string&);
std::unique_ptr<PushCodec> make_bf16(const std::string&);

Registry<PushCodec>& codec_registry() {
  static Registry<PushCodec> r("push codec", {
      {"f32", "f32", "dense float32, sent and applied in place", false, make_f32},
      {"f16", "f16", "IEEE half precision: half the bytes, relative error <= 2^-11, |g| saturated at 65504", false, make_f16},
      {"bf16", "bf16", "bfloat16: half the bytes, float32's range, relative error <= 2^-8", false, make_bf16},
  });
  return r;
}

}  // namespace pslab
