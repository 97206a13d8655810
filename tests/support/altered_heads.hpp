#pragma once

#include <string>
#include <vector>

namespace sluice::testing {

// `text` and every variant of it with one byte replaced, inserted or
// deleted, at every position, the bytes drawn from a set that crosses every
// boundary an HTTP head reader checks: controls, CR and LF, whitespace,
// separators, DEL, obs-text, letters in both cases, digits.
inline std::vector<std::string> altered_heads(const std::string& text) {
  constexpr char kBytes[] = {'\0',   '\t',   ' ', '\r', '\n', ':', ',', '"', '(',    '\x7f',
                             '\x80', '\xff', 'a', 'A',  '0',  '9', '-', '/', '\x1f', '~'};
  std::vector<std::string> texts{text};
  for (std::size_t at = 0; at <= text.size(); ++at) {
    for (char byte : kBytes) {
      texts.push_back(std::string(text).insert(at, 1, byte));
      if (at < text.size() && text[at] != byte) {
        std::string replaced = text;
        replaced[at] = byte;
        texts.push_back(std::move(replaced));
      }
    }
    if (at < text.size()) texts.push_back(std::string(text).erase(at, 1));
  }
  return texts;
}

}  // namespace sluice::testing
