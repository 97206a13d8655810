#include "sluice/http/plain_head.hpp"

#include <gtest/gtest.h>

#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>

namespace sluice {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;

TEST(ParserWaits, OnlyForBeastsTwoWaitingCodes) {
  EXPECT_TRUE(parser_waits(http::error::need_more));
  EXPECT_TRUE(parser_waits(http::error::need_buffer));
  EXPECT_TRUE(parser_waits(parse_wait::need_more));
  EXPECT_TRUE(parser_waits(parse_wait::need_buffer));
  EXPECT_EQ(parse_wait::need_more, http::error::need_more);
  EXPECT_EQ(parse_wait::need_buffer, http::error::need_buffer);

  EXPECT_FALSE(parser_waits({}));
  // The parser's real errors, whatever their number.
  for (auto failure : {http::error::end_of_stream, http::error::partial_message,
                       http::error::bad_chunk, http::error::body_limit, http::error::bad_version}) {
    EXPECT_FALSE(parser_waits(failure)) << error_code(failure).message();
  }
  // Errors of other categories that share the two codes' numbers.
  const int need_more = parse_wait::need_more.value();
  const int need_buffer = parse_wait::need_buffer.value();
  for (int value : {need_more, need_buffer}) {
    EXPECT_FALSE(parser_waits(error_code(value, boost::system::system_category()))) << value;
    EXPECT_FALSE(parser_waits(error_code(value, boost::asio::error::get_misc_category()))) << value;
  }
}

}  // namespace
}  // namespace sluice
